import sys

from pico.infrastructure.cli import main

sys.exit(main())
