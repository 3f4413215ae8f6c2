#!/usr/bin/env python3
"""Creates (or brings up to date) the tests' virtual environment.

    pyenv.py VENV_DIR REQUIREMENTS_FILE

Run by the test harness (tests/it/support.rs) under a file lock, with the system's python3.
A virtual environment is used because stock Debian 12 / Ubuntu 24.04 refuse `pip install`
outside one (PEP 668). Those distributions also ship Python without ensurepip unless
python3-venv is installed; then the environment is made without pip and pip is bootstrapped
from its wheel on PyPI (the wheel can run itself).

The environment is up to date when VENV_DIR/requirements.stamp holds the exact text of the
requirements file; otherwise the requirements are installed and the stamp written last, so an
interrupted install is simply redone.
"""
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
import venv


def venv_python(dir):
    return os.path.join(dir, "Scripts" if os.name == "nt" else "bin", "python")


def has_pip(py):
    return subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode == 0


def bootstrap_pip(dir, py):
    """Installs pip into a pip-less environment from the pip wheel on PyPI."""
    index = "https://pypi.org/pypi/pip/json"
    with urllib.request.urlopen(index, timeout=60) as r:
        meta = json.load(r)
    wheel = next(f for f in meta["urls"] if f["packagetype"] == "bdist_wheel")
    path = os.path.join(dir, wheel["filename"])
    # Mirrors answer with URLs relative to the JSON document.
    url = urllib.parse.urljoin(index, wheel["url"])
    with urllib.request.urlopen(url, timeout=120) as r, open(path, "wb") as out:
        out.write(r.read())
    subprocess.run([py, os.path.join(path, "pip"), "install", "--quiet", "--no-cache-dir", path], check=True)
    os.remove(path)


def main(dir, requirements):
    with open(requirements) as fh:
        wanted = fh.read()
    stamp = os.path.join(dir, "requirements.stamp")
    if os.path.exists(stamp):
        with open(stamp) as fh:
            if fh.read() == wanted:
                return 0
    py = venv_python(dir)
    if not os.path.exists(py):
        sys.stderr.write(f"creating the tests' Python environment in {dir}\n")
        try:
            venv.EnvBuilder(with_pip=True).create(dir)
        except (subprocess.CalledProcessError, OSError) as exc:
            sys.stderr.write(f"venv with pip failed ({exc}); creating it without pip\n")
            venv.EnvBuilder(with_pip=False, clear=True).create(dir)
    if not has_pip(py):
        bootstrap_pip(dir, py)
    sys.stderr.write(f"installing {requirements} into {dir}\n")
    subprocess.run(
        [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", requirements],
        check=True,
    )
    with open(stamp, "w") as fh:
        fh.write(wanted)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
