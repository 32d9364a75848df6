"""A module with a syntax error in the middle."""

import os


def fine(path):
    return os.path.exists(path)


def broken(path:
    return path  # the parenthesis above is never closed


class AlsoFine:
    pass
