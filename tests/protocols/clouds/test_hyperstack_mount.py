"""protocols/clouds/hyperstack_volumes.py `mount_script`, run by sh with the fake VM's block-device
stand-ins first on PATH (tests/fakes/hyperstack_volumes.py `tools`): a blank volume is formatted and
mounted; one already formatted is mounted as it is; one whose first block cannot be read is never
formatted (blkid says "nothing found" for a device it cannot read too)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fakes.hyperstack_volumes import tools

from actor_run.protocols.clouds.hyperstack_volumes import mount_script


def run_script(tmp: Path, *, formatted: bool = False, unreadable: bool = False) -> tuple[int, str, Path]:
    volumes, bin_dir, devices = tmp / "volumes", tmp / "bin", tmp / "devices"
    for d in (volumes, bin_dir, devices):
        d.mkdir()
    for name, text in tools(volumes).items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    vol = volumes / "v1"
    vol.mkdir()
    (vol / "fs").mkdir()
    (vol / "fs" / "weights.bin").write_text("cached")
    if formatted:
        (vol / "superblock").write_text("ar-cache\n")
    if unreadable:
        (vol / "unreadable").touch()
    (devices / "vdb").symlink_to(vol)
    done = subprocess.run(["sh", "-c", mount_script(str(devices / "vdb"), str(tmp / "cache"), wait_s=2)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    return done.returncode, done.stderr, vol


def test_a_blank_volume_is_formatted_and_mounted(tmp_path: Path) -> None:
    code, err, vol = run_script(tmp_path)
    assert code == 0, err
    assert (vol / "superblock").read_text().strip() == "ar-cache"
    assert (tmp_path / "cache" / "lost+found").is_dir()


def test_a_formatted_volume_keeps_its_bytes(tmp_path: Path) -> None:
    code, err, _ = run_script(tmp_path, formatted=True)
    assert code == 0, err
    assert (tmp_path / "cache" / "weights.bin").read_text() == "cached"


def test_a_volume_that_cannot_be_read_is_never_formatted(tmp_path: Path) -> None:
    code, err, vol = run_script(tmp_path, formatted=False, unreadable=True)
    assert code == 5, err
    assert "cannot be read" in err
    assert not (vol / "superblock").exists()  # no mkfs
    assert (vol / "fs" / "weights.bin").read_text() == "cached"
