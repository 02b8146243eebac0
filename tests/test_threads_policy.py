"""The relmql command's OpenMP wait policy, set before torch starts."""

from __future__ import annotations

import os
import subprocess
import sys


def _policy(env_policy):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    code = ("import os, contextlib, io, relmql.cli as c\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    c.main(['--version'])\n"
            "import torch\n"
            "print(os.environ['OMP_WAIT_POLICY'])")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_waiting_threads_sleep_unless_the_user_said_otherwise():
    assert _policy(None) == "PASSIVE"
    assert _policy("ACTIVE") == "ACTIVE"
