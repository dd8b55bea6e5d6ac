import sys

from latticedraft.cli import main

sys.exit(main())
