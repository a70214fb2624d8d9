"""``python -m benchmarks.rollout``: the benchmark's command line (:func:`.cli.main`)."""

from .cli import main

if __name__ == "__main__":
    main()
