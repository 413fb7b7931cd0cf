"""Real trees on disk that reproduce the seeds' broken installations.

Each helper writes what pip would have written (package files, dist-info with
METADATA and a RECORD carrying real sha256 hashes), so the check under test reads
exactly the structures it reads on a real host.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sglang_dflash.manifest import load_manifest

REPO = Path(__file__).resolve().parents[2]


def record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_dist_info(site: Path, name: str, version: str, files: list[str] | None = None,
                    entry_points: str | None = None, requires: list[str] | None = None) -> Path:
    """A dist-info for `name`; RECORD lists `files` (relative to site) with their hashes;
    `requires` become its Requires-Dist headers."""
    di = site / f"{name.replace('-', '_')}-{version}.dist-info"
    di.mkdir(parents=True, exist_ok=True)
    headers = "".join(f"Requires-Dist: {r}\n" for r in requires or ())
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 f"{headers}\n")
    if entry_points:
        (di / "entry_points.txt").write_text(entry_points)
    rows = []
    for rel in [*(files or []), f"{di.name}/METADATA"]:
        rows.append(f"{rel},{record_digest((site / rel).read_bytes())},"
                    f"{(site / rel).stat().st_size}")
    rows.append(f"{di.name}/RECORD,,")
    (di / "RECORD").write_text("\n".join(rows) + "\n")
    return di


def module_files(modules: list[str]) -> list[str]:
    """Paths (relative to site) that make every module and its parents resolvable.

    A module that has submodules in the list becomes a package (`__init__.py`).
    """
    packages = {".".join(m.split(".")[:i]) for m in modules for i in range(1, len(m.split(".")))}
    packages |= {m for m in modules if any(o.startswith(m + ".") for o in modules)}
    files = [p.replace(".", "/") + "/__init__.py" for p in sorted(packages)]
    files += [m.replace(".", "/") + ".py" for m in modules if m not in packages]
    return files


def make_sglang(site: Path, version: str = "0.5.17", modules: list[str] | None = None,
                skip: tuple[str, ...] = (), dist_info: bool = True,
                requires: list[str] | None = None) -> Path:
    """A fake sglang package (+ dist-info/RECORD) holding `modules` minus `skip`.

    Defaults to the manifest's required modules, i.e. a complete 0.5.17.
    """
    mods = [m for m in (modules or load_manifest().required_modules) if m not in skip]
    files = [*module_files(mods), "sglang/srt/server_args.py", "sglang/srt/_core.so"]
    for rel in files:
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"\x7fELF fake" if rel.endswith(".so") else f"# {rel}\n".encode())
    if dist_info:
        write_dist_info(site, "sglang", version, sorted(set(files)), requires=requires)
    return site / "sglang"


def make_torch(site: Path, version: str, cuda: str | None) -> None:
    pkg = site / "torch"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("raise ImportError('fake torch: the check must not import "
                                     "it in-process')\n")
    (pkg / "version.py").write_text(
        "from typing import Optional\n\n"
        f"__version__ = {version!r}\ndebug = False\ncuda: Optional[str] = {cuda!r}\n"
        "git_version = 'fake'\n")
    write_dist_info(site, "torch", version.split("+")[0], ["torch/version.py"])


def make_dist(site: Path, name: str, version: str) -> None:
    write_dist_info(site, name, version)


def make_extension(site: Path, module: str, error: str | None = None,
                   sleep: float | None = None) -> None:
    """An importable module that fails with `error` (ImportError text), hangs, or works."""
    pkg = site / module
    pkg.mkdir(parents=True, exist_ok=True)
    body = f"import time\ntime.sleep({sleep!r})\n" if sleep else ""
    if error is not None:
        body += f"raise ImportError({error!r})\n"
    (pkg / "__init__.py").write_text(body)


def on_pinned_python() -> bool:
    """This interpreter is one the package and its gpu extra install on (pins
    `python.cli_min`..`python.max`: 3.11 and 3.12), so `abi.python` passes here."""
    from sglang_dflash.pins import load_pins, python_versions

    return "{}.{}".format(*sys.version_info[:2]) in python_versions(load_pins())


def assert_passes_but_for_python(rc: int, res: dict) -> None:
    """A faked pinned stack passes; on an interpreter outside requires-python exactly
    `abi.python` FAILs, because that is the truth about this interpreter, not the fake stack."""
    fails = sorted(k for k, r in res.items() if k != "_summary" and r.get("status") == "FAIL")
    if on_pinned_python():
        assert (rc, fails) == (0, []), res
    else:
        assert (rc, fails) == (1, ["abi.python"]), res


def pinned_stack(site: Path, torch: str = "2.11.0+cu130", cuda: str | None = "13.0") -> None:
    """torch + the pinned distributions as metadata, and working extensions."""
    from sglang_dflash.pins import load_pins

    pins = load_pins()
    make_torch(site, torch, cuda)
    for dist, ver in pins.distributions.items():
        if dist not in ("sglang", "torch"):
            make_dist(site, dist, ver)
    for module in load_manifest().extensions.values():
        make_extension(site, module)


def env_with(*sites: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(s) for s in sites)
    env.update(extra)
    return env


def run_check(*args: str, sites: tuple[Path, ...] = (), cwd: Path | None = None,
              timeout: float = 120, env: dict[str, str] | None = None,
              ) -> tuple[int, dict, str, float]:
    """Run `python -m sglang_dflash check ... --json`: (rc, results by id, stderr, seconds).

    `env` adds variables to the child's environment (PYTHONPATH is the sites).
    """
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "sglang_dflash", "check", *args, "--json"],
                       env=env_with(*sites, **(env or {})),
                       cwd=cwd or (sites[0].parent if sites else None),
                       capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - start
    by_id = {}
    if p.stdout.strip():
        data = json.loads(p.stdout)
        by_id = {f"{r['layer']}.{r['name']}": r for r in data["results"]}
        by_id["_summary"] = data["summary"]
    return p.returncode, by_id, p.stderr, elapsed
