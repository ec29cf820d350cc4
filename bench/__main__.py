"""``python -m bench [NAME ...] [--quick] [--profile NAME]``: see bench/README.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.benchmarks import BENCHMARKS
from bench.profiling import KINDS
from bench.runner import Options, run
from bench.server import DEFAULT_IMAGE_CACHE


def parse(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"benchmarks to run (default: all): {', '.join(BENCHMARKS)}")
    p.add_argument("--quick", action="store_true",
                   help="tiny N: about a minute, for the smoke test (figures indicative only)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results",
                   help="where the JSON, PNG and profiles go (default: bench/results)")
    p.add_argument("--image-cache", type=Path, default=DEFAULT_IMAGE_CACHE,
                   help="data dir whose images/ the private server reuses "
                        "(default: $SANDLOT_BENCH_IMAGE_DATA_DIR or /var/lib/sandlot)")
    docker = p.add_mutually_exclusive_group()
    docker.add_argument("--docker", dest="docker", action="store_true", default=None,
                        help="run the docker baselines (default on, off with --quick)")
    docker.add_argument("--no-docker", dest="docker", action="store_false")
    build = p.add_mutually_exclusive_group()
    build.add_argument("--build-images", dest="build_images", action="store_true", default=None,
                       help="build the images the chosen benchmarks measure (code-interpreter) "
                            "if missing (default on, off with --quick; slow the first time)")
    build.add_argument("--no-build-images", dest="build_images", action="store_false")
    p.add_argument("--profile", metavar="NAME", choices=list(BENCHMARKS),
                   help="run NAME under a profiler; output saved under --out")
    p.add_argument("--profiler", choices=KINDS, default="py-spy",
                   help="py-spy: the server (and execd) processes; pyinstrument: the client")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="time for all benchmarks together (default 2700, 300 with --quick); "
                        "a benchmark is cut at what is left, later ones are not run")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    a = p.parse_args(argv)
    if a.list:
        for name, fn in BENCHMARKS.items():
            doc = (sys.modules[fn.__module__].__doc__ or "").strip().splitlines()[0]
            print(f"{name:10} {doc}")
        raise SystemExit(0)
    names = a.names or ([a.profile] if a.profile else list(BENCHMARKS))
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    if a.profile and a.profile not in names:
        names.append(a.profile)
    return Options(names=names, quick=a.quick, out_dir=a.out, image_cache=a.image_cache,
                   docker=a.docker, build_images=a.build_images, profile=a.profile,
                   profiler=a.profiler, budget=a.budget)


def main(argv: list[str] | None = None) -> int:
    _, code = run(parse(sys.argv[1:] if argv is None else argv))
    return code


if __name__ == "__main__":
    sys.exit(main())
