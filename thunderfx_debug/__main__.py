import sys

from thunderfx_debug.commands.cli import main

sys.exit(main())
