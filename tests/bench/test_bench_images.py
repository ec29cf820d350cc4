"""A full ``python -m bench`` builds the images its benchmarks measure; ``--quick`` does not."""

from __future__ import annotations

from bench.__main__ import parse
from bench.runner import images_to_build


def test_full_run_builds_the_code_interpreter_image() -> None:
    assert images_to_build(parse([])) == ["code-interpreter"]
    assert images_to_build(parse(["code", "create"])) == ["code-interpreter"]


def test_runs_that_measure_no_such_image_build_nothing() -> None:
    assert images_to_build(parse(["create", "commands"])) == []


def test_quick_builds_only_when_asked() -> None:
    assert images_to_build(parse(["--quick"])) == []
    assert images_to_build(parse(["--quick", "--build-images", "jupyter"])) == ["code-interpreter"]
    assert images_to_build(parse(["--no-build-images", "code"])) == []
