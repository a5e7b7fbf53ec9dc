import sys

from xtrain.cli import main

sys.exit(main())
