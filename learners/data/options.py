"""The data keys and :class:`DataOptions`, the typed form the readers take.

A key module: it imports only the standard library and ``angelconf.config``, so the CLI's
config-only verbs can list these keys without numpy or pyarrow. Every default lives in its
``Key`` below; each field of :class:`DataOptions` names its key, :meth:`DataOptions.from_config`
reads them all once (``Key.read``: the value, or the declared default when missing), at the entry
point (``learners.job.job_options``), and the readers see only the frozen object.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from angelconf.config import Key
from angelconf.options import check_keys, key_field, read_keys

__all__ = [
    "FORMATS",
    "KEYS",
    "LABEL_TRANSFORMS",
    "DataOptions",
    "check_splitor",
    "split_period",
]

FORMATS = ("libsvm", "dummy", "dense", "parquet")
LABEL_TRANSFORMS = ("NoTrans", "PosNegTrans", "ZeroOneTrans", "AddOneTrans", "SubOneTrans")


def _check_ratio(v: float) -> str | None:
    return None if 0.0 <= v < 1.0 else "a number in [0, 1)"


def _check_range(v: int) -> str | None:
    return None if v == -1 or v >= 1 else "-1 (unbounded) or an integer >= 1"


def check_splitor(v: str) -> str | None:
    """What ``ml.data.splitor`` must be when ``v`` is not valid, else None."""
    if v == "":
        return r"a non-empty regular expression such as \\s+ or ,"
    if v in ("s+", "s"):
        # java.util.Properties reads "\s" as "s": the user meant whitespace.
        return r"a regular expression; a .properties file reads \s as s, so write \\s+"
    try:
        re.compile(v)
    except re.error as e:
        return f"a valid regular expression ({e})"
    return None


def _check_chunk(v: int) -> str | None:
    return None if v >= 1 else "an integer >= 1"


DATA_TYPE = Key(
    "ml.data.type",
    "str",
    "libsvm",
    "Input format: libsvm (1-based ids), dummy (0-based ids, value 1), dense, or parquet.",
    choices=FORMATS,
)
SPLITOR = Key(
    "ml.data.splitor",
    "str",
    r"\s+",
    r"Separator between the fields of a text line, a regular expression (Angel's default \s+; in a .properties file write \\s+).",
    check=check_splitor,
)
HAS_LABEL = Key(
    "ml.data.has.label",
    "bool",
    True,
    "Whether the first field of each line is the label (false: labels are NaN, for prediction).",
)
SID = Key(
    "ml.data.sid",
    "bool",
    False,
    "Whether the first field of each text line is a sample id (a number or a string), before "
    "the label if any; prediction writes it in a sid column. Angel's predict files "
    "(sid i:v ...): ml.data.sid=true with ml.data.has.label=false.",
)
VALIDATE_RATIO = Key(
    "ml.data.validate.ratio",
    "float",
    0.05,
    "Share of the training input held out for validation: line i goes to validation iff i % ceil(1/ratio) == 0 (0: no validation split).",
    check=_check_ratio,
)
INDEX_RANGE = Key(
    "ml.feature.index.range",
    "int",
    -1,
    "Number of feature ids (0-based ids must be < this; libsvm file ids 1..range; dense rows must have this many values); -1: unbounded.",
    check=_check_range,
)
FIELD_NUM = Key(
    "ml.fm.field.num",
    "int",
    -1,
    "Number of fields: every row must have exactly this many features (FM-style models); -1: not checked.",
    check=_check_range,
)
LABEL_TRANS = Key(
    "ml.data.label.trans.class",
    "str",
    "NoTrans",
    "Label transform applied while reading: NoTrans; PosNegTrans (y > threshold -> 1 else -1); ZeroOneTrans (y > threshold -> 1 else 0); AddOneTrans (y + 1); SubOneTrans (y - 1).",
    choices=LABEL_TRANSFORMS,
)
LABEL_THRESHOLD = Key(
    "ml.data.label.trans.threshold", "float", 0.0, "Threshold of PosNegTrans and ZeroOneTrans."
)
SKIP_BAD_LINES = Key(
    "ml.data.skip.bad.lines",
    "bool",
    False,
    "Skip malformed lines and count them (false: the first malformed line stops the job with its file and line number).",
)
USE_SHUFFLE = Key(
    "ml.data.use.shuffle",
    "bool",
    False,
    "Shuffle the training rows, with a new order every epoch derived from the seed and the epoch.",
)
TRAIN_PATH = Key(
    "angel.train.data.path",
    "str",
    None,
    "Training input: a file, or a directory whose files are read in name order.",
)
VALIDATE_PATH = Key(
    "angel.validate.data.path",
    "str",
    None,
    "Validation input; when set, ml.data.validate.ratio is not used and all of the training input trains.",
)
PREDICT_PATH = Key(
    "angel.predict.data.path", "str", None, "Input of prediction (a file or a directory)."
)
PARQUET_LABEL_COL = Key(
    "ml.data.parquet.label.col",
    "str",
    "label",
    "Parquet input: name of the label column (numeric).",
)
PARQUET_IDS_COL = Key(
    "ml.data.parquet.ids.col",
    "str",
    "ids",
    "Parquet input: name of the list<int> column of 0-based feature ids.",
)
PARQUET_VALUES_COL = Key(
    "ml.data.parquet.values.col",
    "str",
    "values",
    "Parquet input: name of the list<float> column of feature values (a missing column means every value is 1).",
)
CHUNK_ROWS = Key(
    "ml.data.chunk.rows",
    "int",
    65536,
    "Rows a worker parses at a time when streaming its part of the input.",
    check=_check_chunk,
)

KEYS = [
    DATA_TYPE,
    SPLITOR,
    HAS_LABEL,
    SID,
    VALIDATE_RATIO,
    INDEX_RANGE,
    FIELD_NUM,
    LABEL_TRANS,
    LABEL_THRESHOLD,
    SKIP_BAD_LINES,
    USE_SHUFFLE,
    TRAIN_PATH,
    VALIDATE_PATH,
    PREDICT_PATH,
    PARQUET_LABEL_COL,
    PARQUET_IDS_COL,
    PARQUET_VALUES_COL,
    CHUNK_ROWS,
]


def _optional_path(value: Any) -> str | None:
    return str(value) if value else None


@dataclass(frozen=True)
class DataOptions:
    """Everything the readers need to know about the input, one field per data key.

    Each field names its key (``key_field``): :meth:`from_config` reads them all, and
    ``__post_init__`` runs the keys' own checks on an object built directly (the Python API,
    tests), so both fail as a loaded file does. A field's default is its key's.
    """

    kind: str = key_field(DATA_TYPE)  # lower case
    splitor: str = key_field(SPLITOR)
    has_label: bool = key_field(HAS_LABEL)
    sid: bool = key_field(SID)
    validate_ratio: float = key_field(VALIDATE_RATIO)
    index_range: int = key_field(INDEX_RANGE)
    field_num: int = key_field(FIELD_NUM)
    label_trans: str = key_field(LABEL_TRANS)
    label_threshold: float = key_field(LABEL_THRESHOLD)
    skip_bad_lines: bool = key_field(SKIP_BAD_LINES)
    use_shuffle: bool = key_field(USE_SHUFFLE)
    train_path: str | None = key_field(TRAIN_PATH, convert=_optional_path)
    validate_path: str | None = key_field(VALIDATE_PATH, convert=_optional_path)
    predict_path: str | None = key_field(PREDICT_PATH, convert=_optional_path)
    parquet_label_col: str = key_field(PARQUET_LABEL_COL)
    parquet_ids_col: str = key_field(PARQUET_IDS_COL)
    parquet_values_col: str = key_field(PARQUET_VALUES_COL)
    chunk_rows: int = key_field(CHUNK_ROWS)

    def __post_init__(self) -> None:
        check_keys(self)

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> DataOptions:
        """The data keys of ``conf`` (a loaded Config or a plain mapping of typed values)."""
        return cls(**read_keys(cls, conf))

    @property
    def holds_out_validation(self) -> bool:
        """Whether validation rows come out of the training input (no validation path, ratio > 0)."""
        return not self.validate_path and self.validate_ratio > 0


def split_period(opts: DataOptions) -> int:
    """``P = ceil(1 / ml.data.validate.ratio)``, the block length of worker parts; 1 when the ratio is 0."""
    ratio = opts.validate_ratio
    # The epsilon keeps 1/0.05 = 20.000000000000004 from becoming 21.
    return max(1, math.ceil(1.0 / ratio - 1e-9)) if ratio > 0 else 1
