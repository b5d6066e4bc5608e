import sys

from jaxconv.algorithms import main

sys.exit(main())
