import sys

from thunderfx_debug.cli import main

sys.exit(main())
