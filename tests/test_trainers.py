"""ReportingBackend under the trainers people use: PyTorch Lightning's `Trainer.fit` and Hugging Face's `Trainer`, on
CPU with Thunder's default executors and tiny models. Each writes a dump of what the run compiled, and trains to
the same weights as the same trainer without compiling."""

from __future__ import annotations

import pytest
import torch

from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.records import SplitKind

STEPS = 5


def _assert_dump_of_the_run(dump_dir, calls: int) -> None:
    report = load_report(dump_dir)
    assert report.graphs, "the trainer's run compiled nothing"
    assert [g.calls for g in report.graphs] == [calls] * len(report.graphs)
    # The trainer's optimizer steps, counted by torch's step hook (Lightning compiles a deep copy of the backend).
    assert report.steps is not None and report.steps.count == calls
    thunder = [s for g in report.graphs for s in g.splits if s.kind is SplitKind.THUNDER]
    assert thunder and all(s.fwd_trace and s.bwd_trace for s in thunder)
    assert all(g.timing is not None and g.timing.count >= 1 for g in report.graphs)


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, msg=lambda m: f"{name}: {m}")


# ---- PyTorch Lightning --------------------------------------------------------------------------------------------


def _lightning_module(backend):
    import lightning as L

    class Regression(L.LightningModule):
        """Compiles its network, not itself: `torch.compile` of a whole LightningModule fails at its first
        `self.log` on torch 2.13 (Lightning-AI/pytorch-lightning#21836)."""

        def __init__(self):
            super().__init__()
            net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
            self.net = torch.compile(net, backend=backend) if backend is not None else net

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Regression()


def _fit(backend):
    import lightning as L

    torch.manual_seed(0)
    module = _lightning_module(backend)
    data = torch.utils.data.TensorDataset(torch.randn(8 * STEPS, 16), torch.randn(8 * STEPS, 1))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    assert trainer.global_step == STEPS
    return module


def test_lightning_trainer_fit_writes_a_dump(tmp_path):
    pytest.importorskip("lightning", reason="the test extras install lightning")
    backend = ReportingBackend(dump_dir=tmp_path / "dump", timing_every=2, timing_warmup=1, strict=True)
    trained = _fit(backend)
    backend.flush()
    _assert_dump_of_the_run(tmp_path / "dump", calls=STEPS)
    torch._dynamo.reset()
    _assert_same_weights(trained, _fit(None))


# ---- Hugging Face Trainer -------------------------------------------------------------------------------------------


class TinyLM(torch.nn.Module):
    """What Trainer needs of a model: `forward(input_ids, labels)` returning a dict with the loss."""

    def __init__(self, vocab: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 32)
        self.head = torch.nn.Linear(32, vocab)

    def forward(self, input_ids, labels=None):
        logits = self.head(torch.nn.functional.gelu(self.embed(input_ids)))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, vocab: int = 64, length: int = 8):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _hf_train(tmp_path, backend):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = TinyLM()
    if backend is not None:
        # nn.Module.compile compiles in place: the model keeps its class and forward signature, which Trainer reads
        # to choose the dataset's columns (a callable backend in TrainingArguments is refused by accelerate).
        model.compile(backend=backend)
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, max_steps=STEPS,
                             per_device_train_batch_size=2, report_to=[], dataloader_num_workers=0,
                             dataloader_pin_memory=False, save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(2 * STEPS))
    result = trainer.train()
    assert result.global_step == STEPS
    return model


def test_hugging_face_trainer_on_a_compiled_model_writes_a_dump(tmp_path):
    pytest.importorskip("transformers", reason="the test extras install transformers")
    pytest.importorskip("accelerate", reason="the test extras install accelerate")
    # The Trainer trains on the CPU (use_cpu) even where CUDA is present; there Thunder 0.2.6's default executors
    # include nvFuser, whose cross_entropy claims the CPU tensors and then cannot run them. CPU-only executors are
    # what a machine without CUDA gets.
    import thunder

    executors = [e for e in thunder.get_default_executors() if e.name != "nvfuser"]
    backend = ReportingBackend(dump_dir=tmp_path / "dump", timing_every=2, timing_warmup=1, strict=True,
                               executors=executors)
    trained = _hf_train(tmp_path, backend)
    backend.flush()
    _assert_dump_of_the_run(tmp_path / "dump", calls=STEPS)
    torch._dynamo.reset()
    _assert_same_weights(trained, _hf_train(tmp_path, None))
