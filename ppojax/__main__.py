import sys

from ppojax.cli.commands import main

sys.exit(main())
