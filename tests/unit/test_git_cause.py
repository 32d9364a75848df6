"""The one-line cause of a failed git command (:func:`scopekb.gitrepo.git_cause`): the hostile review saw a fetch
over ssh reported as "failed: and the repository exists.'", git's closing advice with GitPython's quote."""

from __future__ import annotations

import git

from scopekb.gitrepo import GIT_CAUSE_LIMIT, git_cause


def _err(stderr: str | None) -> git.GitCommandError:
    return git.GitCommandError(["git", "fetch"], 128, stderr=stderr)


def test_the_cause_is_the_lines_up_to_the_first_fatal_one_without_gitpythons_wrapper() -> None:
    ssh = ("ssh: connect to host 127.0.0.1 port 22: Connection refused\r\nfatal: Could not read from remote "
           "repository.\n\nPlease make sure you have the correct access rights\nand the repository exists.")
    assert git_cause(_err(ssh)) == ("ssh: connect to host 127.0.0.1 port 22: Connection refused; fatal: Could not "
                                    "read from remote repository.")
    assert git_cause(_err("fatal: repository '/x' does not exist\n")) == "fatal: repository '/x' does not exist"
    assert git_cause(_err("warning: one\nerror: two\nthree")) == "warning: one; error: two"
    assert git_cause(_err("just this\nand this")) == "and this"


def test_a_hostile_or_empty_stderr_still_gives_one_bounded_line() -> None:
    out = git_cause(_err("remote: \x1b[31mred\x1b[0m " + "x" * 5000 + "\nfatal: no"))
    assert "\x1b" not in out and "\n" not in out and len(out) == GIT_CAUSE_LIMIT
    assert git_cause(_err(None)).startswith("Cmd('git') failed")
    assert "\n" not in git_cause(_err(None))
