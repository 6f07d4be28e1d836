import sys

from shoal.server.cli import main

sys.exit(main())
