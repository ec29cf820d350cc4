"""Plain commands run without a bash start-up of their own.

``bash -c "prog arg ..."`` on one simple command execs ``prog`` in place of itself (bash's
one-command optimisation), so all bash adds to such a command is its own start-up, ~1 ms on
the dev VM (a quarter of a ``commands.run("true")`` round trip), and three exported
variables: ``PWD``, ``SHLVL`` and ``_``. ``plain_argv`` recognises commands made only of
plain words (no quoting, expansion, redirection, globbing, operator or assignment: nothing
bash would interpret) whose program is not a bash builtin or keyword, and ``bash_like_env``
sets those three variables exactly as bash does. Everything else, and any command whose
program cannot be exec'd (not found, not executable, a script without ``#!``), runs through
bash as before, so messages and exit codes stay bash's.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping

# Words bash would pass through untouched: no quotes, $, `, \, globs, braces, tilde,
# redirections, operators, comments or history characters.
_PLAIN = re.compile(r"[A-Za-z0-9_./:,=+@%-]+(?: +[A-Za-z0-9_./:,=+@%-]+)*")

# `compgen -b -k` of bash 5: these behave differently (or only exist) inside bash. `true` and
# `false` are left out on purpose: their programs do exactly what the builtins do.
_BASH_ONLY = frozenset(
    ". : [ alias bg bind break builtin caller cd command compgen complete compopt continue "
    "declare dirs disown echo enable eval exec exit export fc fg getopts hash help history "
    "jobs kill let local logout mapfile popd printf pushd pwd read readarray readonly return "
    "set shift shopt source suspend test times trap type typeset ulimit umask unalias unset "
    "wait if then else elif fi case esac for select while until do done in function time "
    "{ } ! [[ ]] coproc".split()
)

# Set in the environment, these make bash run code before the command (a startup file, or
# exported functions that could shadow the program): such commands keep going through bash.
_STARTUP_VARS = ("BASH_ENV", "ENV")
_FUNCTION_PREFIX = "BASH_FUNC_"


def plain_argv(command: str, env: Mapping[str, str]) -> list[str] | None:
    """The argv bash would exec for ``command``, or None when bash must run it."""
    words = command.strip(" ").split(" ")
    if not _PLAIN.fullmatch(command.strip(" ")):
        return None
    words = [w for w in words if w]
    program = words[0]
    if program in _BASH_ONLY or "=" in program:
        return None
    if any(env.get(name) for name in _STARTUP_VARS):
        return None
    if any(key.startswith(_FUNCTION_PREFIX) for key in env):
        return None
    return words


def bash_like_env(env: Mapping[str, str], argv: list[str], cwd: str) -> dict[str, str] | None:
    """``env`` as ``bash -c`` hands it to the program it execs; None if it is not found."""
    program = argv[0]
    search = env.get("PATH", os.defpath)
    if "/" in program:
        path = program
    elif any(not os.path.isabs(d) for d in search.split(os.pathsep)):
        return None  # relative PATH entries are relative to the command's cwd: let bash look
    else:
        found = shutil.which(program, path=search)
        if found is None:
            return None  # bash reports it (its message, exit code 127)
        path = found
    out = dict(env)
    # bash keeps an inherited absolute PWD naming the working directory, else the real path.
    inherited = env.get("PWD", "")
    try:
        keep = os.path.isabs(inherited) and os.path.samefile(inherited, cwd)
    except OSError:
        keep = False
    out["PWD"] = inherited if keep else os.path.realpath(cwd)
    # bash raises SHLVL on start and lowers it again before exec'ing the last command.
    level = env.get("SHLVL", "")
    out["SHLVL"] = str(int(level)) if level.isdigit() else "0"
    out["_"] = path
    return out
