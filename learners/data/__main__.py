"""``python -m learners.data SRC DST [--set key=value ...]``: convert a text input to Parquet."""

from learners.data.convert import main

# Guarded: tools that import every module of the package (key discovery) must not run it.
if __name__ == "__main__":
    raise SystemExit(main())
