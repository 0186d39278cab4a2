import sys

from ppojax.cli import main

sys.exit(main())
