"""Training data: libsvm, dummy, dense and Parquet readers that hand out CSR mini-batches.

The modules, one idea each:

- :mod:`~learners.data.options`: the data keys and :class:`DataOptions` (standard library only)
- :mod:`~learners.data.batch`: :class:`Batch`, the CSR mini-batch, and :func:`concat`
- :mod:`~learners.data.labels`: label transforms and the binary / multiclass label checks
- :mod:`~learners.data.problems`: :class:`DataError`, :class:`ReadStats`, raise-or-skip
- :mod:`~learners.data.text`: the libsvm / dummy / dense line parser
- :mod:`~learners.data.parquet`: the Parquet record-batch parser
- :mod:`~learners.data.reader`: one worker's part of an input, chunk by chunk
- :mod:`~learners.data.split`: the training / validation split
- :mod:`~learners.data.minibatches`: the mini-batches of an epoch
- :mod:`~learners.data.convert`: text to Parquet (``python -m learners.data SRC DST``)

The public face is imported lazily (PEP 562): ``import learners.data.options`` (the keys, read
by the CLI's config-only verbs) runs this file first and must not pull in numpy or pyarrow.
The keys themselves are ``learners.data.options.KEYS``, deliberately not re-exported here, so
that each key list has one home.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from angelps.lazy import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "FORMATS": "learners.data.options",
    "LABEL_TRANSFORMS": "learners.data.options",
    "DataOptions": "learners.data.options",
    "split_period": "learners.data.options",
    "Batch": "learners.data.batch",
    "concat": "learners.data.batch",
    "binary_labels01": "learners.data.labels",
    "label_transform": "learners.data.labels",
    "multiclass_labels": "learners.data.labels",
    "DataError": "learners.data.problems",
    "ReadStats": "learners.data.problems",
    "input_files": "learners.data.reader",
    "line_of": "learners.data.reader",
    "load_file": "learners.data.reader",
    "read_file": "learners.data.reader",
    "iter_train_chunks": "learners.data.split",
    "load_train_valid": "learners.data.split",
    "validation_mask": "learners.data.split",
    "iter_minibatches": "learners.data.minibatches",
    "iter_stream_minibatches": "learners.data.minibatches",
    "to_parquet": "learners.data.convert",
}

__all__ = [  # the keys of _EXPORTS, spelled out for linters
    "FORMATS",
    "LABEL_TRANSFORMS",
    "Batch",
    "DataError",
    "DataOptions",
    "ReadStats",
    "binary_labels01",
    "concat",
    "input_files",
    "iter_minibatches",
    "iter_stream_minibatches",
    "iter_train_chunks",
    "label_transform",
    "line_of",
    "load_file",
    "load_train_valid",
    "multiclass_labels",
    "read_file",
    "split_period",
    "to_parquet",
    "validation_mask",
]

if TYPE_CHECKING:
    from learners.data.batch import Batch, concat
    from learners.data.convert import to_parquet
    from learners.data.labels import binary_labels01, label_transform, multiclass_labels
    from learners.data.minibatches import iter_minibatches, iter_stream_minibatches
    from learners.data.options import FORMATS, LABEL_TRANSFORMS, DataOptions, split_period
    from learners.data.problems import DataError, ReadStats
    from learners.data.reader import input_files, line_of, load_file, read_file
    from learners.data.split import iter_train_chunks, load_train_valid, validation_mask


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
