"""The worker's handler on its own (no queue): the payload it refuses, the environment the job sees,
what it streams and returns."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from actor_run.protocols.serverless import JobExited, PayloadError, decode_blob, encode_blob, pack, run, unpack


def payload(command: str, archive: bytes, **kw: Any) -> dict[str, Any]:
    return {"actor_run": 1, "command": command, "seed": 4, "attempt": 2, "env": {"MINE": "x"},
            "archive": encode_blob(archive), "stream_s": 0.05, **kw}


def test_the_job_sees_what_a_machines_job_sees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_AI_API_KEY", "the-workers-own")
    code = tmp_path / "code"
    code.mkdir()
    (code / "show.sh").write_text(
        'env | grep -E "^(ACTOR_RUN_|MINE=|RUNPOD)" | sort > "$ACTOR_RUN_OUT/env.txt"; pwd >> "$ACTOR_RUN_OUT/env.txt";'
        ' cat "$ACTOR_RUN_IN/words/w.txt" >> "$ACTOR_RUN_OUT/env.txt"\n')
    (tmp_path / "w.txt").write_text("hi\n")
    archive = pack([("code", code), ("in/words/w.txt", tmp_path / "w.txt")])
    chunks = list(run(payload("sh show.sh", archive, code=True), scratch=tmp_path))
    last = chunks[-1]
    assert last["exit_code"] == 0
    unpack(decode_blob(last["out"]), tmp_path / "got")
    lines = (tmp_path / "got" / "out" / "env.txt").read_text().splitlines()
    keys = {ln.split("=", 1)[0] for ln in lines if "=" in ln}
    seen = {"ACTOR_RUN_SEED", "ACTOR_RUN_ATTEMPT", "ACTOR_RUN_IN", "ACTOR_RUN_OUT", "ACTOR_RUN_PROGRESS", "MINE"}
    assert seen <= keys
    assert "ACTOR_RUN_SEED=4" in lines
    assert "ACTOR_RUN_ATTEMPT=2" in lines
    assert not any(k.startswith("RUNPOD") for k in keys)  # the worker's key is not the job's
    assert lines[-2].endswith("/code")  # the code snapshot is the working folder
    assert lines[-1] == "hi"
    assert list(tmp_path.glob("actor-run-job-*")) == []  # its folder is gone after the job


def test_progress_and_log_stream_as_they_come_and_a_non_zero_exit_raises_after_the_last_chunk(
    tmp_path: Path,
) -> None:
    cmd = 'echo "{\\"stage\\": \\"train\\"}" >> "$ACTOR_RUN_PROGRESS"; echo one; sleep 0.3; echo two; exit 5'
    chunks: list[dict[str, Any]] = []
    with pytest.raises(JobExited, match="the job exited 5"):
        chunks.extend(run(payload(cmd, pack([])), scratch=tmp_path))
    assert "".join(c.get("progress", "") for c in chunks) == '{"stage": "train"}\n'
    assert "".join(c.get("log", "") for c in chunks) == "one\ntwo\n"
    assert chunks[0].get("log", "").startswith("one")  # streamed before the job ended
    assert chunks[-1]["exit_code"] == 5


def test_an_archive_that_does_not_match_its_hash_is_refused_before_anything_runs(tmp_path: Path) -> None:
    p = payload("touch ran", pack([]))
    p["archive"]["sha256"] = "0" * 64
    with pytest.raises(PayloadError, match="sha256"):
        list(run(p, scratch=tmp_path))
    assert not list(tmp_path.rglob("ran"))


def test_a_member_reaching_outside_the_folder_is_not_extracted(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"evil"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("fine.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (tmp_path / "dest").mkdir()
    unpack(buf.getvalue(), tmp_path / "dest")
    assert (tmp_path / "dest" / "fine.txt").read_bytes() == b"evil"
    assert not (tmp_path / "escaped.txt").exists()
    assert json.dumps(encode_blob(b"x"))  # a blob is plain JSON
