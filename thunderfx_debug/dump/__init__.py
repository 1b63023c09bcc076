"""A dump on disk: `files` writes the (path, content) pairs of a flush atomically per rank (manifest last, only the
files that changed) and reads a dump back without importing thunder or executing code; `runs` derives the run id
that every rank of one job agrees on, under which an earlier run of the same directory is moved aside. Nothing here
builds records or renders them: the artifacts hand the pairs down, the renderers read what comes back."""
