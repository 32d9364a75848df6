"""scopekb command line."""

import os

# GitPython checks for the git executable when it is imported and raises a 40-line ImportError without it (README
# newcomer): every command, even those that never read a repository, died with a traceback. "quiet" defers the
# failure to the first git call, which the CLI reports as one line.
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
