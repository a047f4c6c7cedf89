import os
import sys

# Tests run from a checkout without installing: make the top-level packages importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
