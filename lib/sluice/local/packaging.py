"""``osls package`` on a copy of the project, offline: no AWS account, no credentials, no endpoint."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from sluice.local.moto_server import REGION

CREATE_TEMPLATE = "cloudformation-template-create-stack.json"
UPDATE_TEMPLATE = "cloudformation-template-update-stack.json"
# What the copy of the project handed to osls leaves out: build output, local environments, caches.
COPY_IGNORE = frozenset(
    {
        ".git",
        "node_modules",
        ".serverless",
        "demo-out",
        "bench",
        "tests",
        "docs",
        "__pycache__",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
    }
)
log = logging.getLogger("sluice.local")


class PackagingError(RuntimeError):
    """npm or osls is missing or failed."""


def project_root() -> Path:
    """The directory holding serverless.yml: the working directory, else this checkout."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[3]):
        if (candidate / "serverless.yml").is_file():
            return candidate
    raise PackagingError("serverless.yml not found: run from the project's root directory")


def offline_environment() -> dict[str, str]:
    """The environment osls packages in: no profile, placeholder keys, no endpoint (see mk/package.mk)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="packaging-needs-no-credentials",
        AWS_SECRET_ACCESS_KEY="packaging-needs-no-credentials",
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    return env


def ensure_node_modules(root: Path) -> None:
    """``npm ci`` when osls is not installed yet. A missing npm is an error, never a skip."""
    if (root / "node_modules" / ".bin" / "osls").exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise PackagingError(
            "npm is not installed: install Node.js 20.19+, 22.13+ or 24+ with npm, then retry"
        )
    log.info("installing the npm packages (npm ci)")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"], cwd=root, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise PackagingError(f"npm ci failed ({done.returncode}):\n{_tail(done.stdout + done.stderr)}")


def package_stack(
    workdir: Path,
    *,
    stage: str,
    params: Mapping[str, str] | None = None,
    root: Path | None = None,
    timeout: float = 600,
) -> Path:
    """``osls package --stage <stage> --param=k=v`` on a copy of the project in ``workdir``.

    A copy, so a ``make package`` running at the same time in the project keeps its own
    ``.serverless``. Returns the ``.serverless`` directory of the copy.
    """
    root = root or project_root()
    if shutil.which("npx") is None or shutil.which("node") is None:
        raise PackagingError("node and npx are not installed: install Node.js 20.19+, 22.13+ or 24+ with npm")
    ensure_node_modules(root)
    source = workdir / "project"
    if source.exists():
        shutil.rmtree(source)
    shutil.copytree(root, source, ignore=_ignore, symlinks=True)
    (source / "node_modules").symlink_to(root / "node_modules", target_is_directory=True)
    command = ["npx", "--no-install", "osls", "package", "--stage", stage]
    command += [f"--param={name}={value}" for name, value in (params or {}).items()]
    done = subprocess.run(
        command,
        cwd=source,
        env=offline_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = source / ".serverless"
    if done.returncode != 0 or not (out / UPDATE_TEMPLATE).is_file():
        raise PackagingError(
            f"{' '.join(command)} failed ({done.returncode}):\n{_tail(done.stdout + done.stderr)}"
        )
    return out


def _ignore(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in COPY_IGNORE or n.startswith((".venv", ".lockenv"))}


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
