"""The command line's basics: versions, the demo core by name, a closed pipe, `flare run`
without a core."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flare import __version__

FLARE = [sys.executable, "-m", "flare.cli"]
FLARE_SERVE = [sys.executable, "-c", "import sys; from flare.cli import serve_main; sys.exit(serve_main())"]


@pytest.mark.parametrize("command, name", [(FLARE, "flare"), (FLARE_SERVE, "flare-serve")])
def test_version(command, name):
    run = subprocess.run([*command, "--version"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == f"{name} {__version__}"


def test_info_knows_the_demo_core_by_name():
    from flare.core.embedded import demo_core

    run = subprocess.run([*FLARE, "info", "demo", "--no-verify"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == f"{demo_core()}:"
    assert "SmolLM2-135M-Instruct: LlamaForCausalLM, 30 layers" in run.stdout


def test_info_into_a_closed_pipe_ends_without_a_traceback():
    proc = subprocess.Popen([*FLARE, "info", "demo", "--no-verify"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    proc.stdout.close()  # the reader went away, as `flare info demo | head -0` does
    err = proc.stderr.read()
    assert proc.wait(60) == 1
    assert "Traceback" not in err and "Exception ignored" not in err and "Broken pipe" not in err, err
