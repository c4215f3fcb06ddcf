import sys

from models.lab import main

sys.exit(main())
