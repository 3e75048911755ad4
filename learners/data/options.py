"""The data keys and :class:`DataOptions`, the typed form the readers take.

A key module: it imports only the standard library and ``angelconf.config``, so the CLI's
config-only verbs can list these keys without numpy or pyarrow. Every default lives in its
``Key`` below; :meth:`DataOptions.from_config` reads each key once (``Key.read``: the value,
or the declared default when missing), at the entry point, and the readers see only the
frozen object.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from angelconf.config import Key

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

    Built with :meth:`from_config`; the checks in ``__post_init__`` repeat the keys' own checks
    so that options built from a plain mapping (the Python API, tests) fail the same way.
    """

    kind: str = DATA_TYPE.default  # ml.data.type, lower case
    splitor: str = SPLITOR.default
    has_label: bool = HAS_LABEL.default
    sid: bool = SID.default
    validate_ratio: float = VALIDATE_RATIO.default
    index_range: int = INDEX_RANGE.default
    field_num: int = FIELD_NUM.default
    label_trans: str = LABEL_TRANS.default
    label_threshold: float = LABEL_THRESHOLD.default
    skip_bad_lines: bool = SKIP_BAD_LINES.default
    use_shuffle: bool = USE_SHUFFLE.default
    train_path: str | None = TRAIN_PATH.default
    validate_path: str | None = VALIDATE_PATH.default
    predict_path: str | None = PREDICT_PATH.default
    parquet_label_col: str = PARQUET_LABEL_COL.default
    parquet_ids_col: str = PARQUET_IDS_COL.default
    parquet_values_col: str = PARQUET_VALUES_COL.default
    chunk_rows: int = CHUNK_ROWS.default

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", self.kind.lower())
        if self.kind not in FORMATS:
            raise ValueError(
                f"ml.data.type={self.kind} is not valid: expected one of {', '.join(FORMATS)}"
            )
        problem = check_splitor(self.splitor)
        if problem:
            raise ValueError(f"ml.data.splitor={self.splitor} is not valid: expected {problem}")
        problem = _check_ratio(self.validate_ratio)
        if problem:
            raise ValueError(
                f"ml.data.validate.ratio={self.validate_ratio} is not valid: expected {problem}"
            )
        if self.label_trans.lower() not in {t.lower() for t in LABEL_TRANSFORMS}:
            raise ValueError(
                f"ml.data.label.trans.class={self.label_trans} is not valid: expected one of "
                f"{', '.join(LABEL_TRANSFORMS)}"
            )
        problem = _check_chunk(self.chunk_rows)
        if problem:
            raise ValueError(
                f"ml.data.chunk.rows={self.chunk_rows} is not valid: expected {problem}"
            )

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> DataOptions:
        """The data keys of ``conf`` (a loaded Config or a plain mapping of typed values)."""
        return cls(
            kind=str(DATA_TYPE.read(conf)),
            splitor=str(SPLITOR.read(conf)),
            has_label=bool(HAS_LABEL.read(conf)),
            sid=bool(SID.read(conf)),
            validate_ratio=float(VALIDATE_RATIO.read(conf)),
            index_range=int(INDEX_RANGE.read(conf)),
            field_num=int(FIELD_NUM.read(conf)),
            label_trans=str(LABEL_TRANS.read(conf)),
            label_threshold=float(LABEL_THRESHOLD.read(conf)),
            skip_bad_lines=bool(SKIP_BAD_LINES.read(conf)),
            use_shuffle=bool(USE_SHUFFLE.read(conf)),
            train_path=_optional_path(TRAIN_PATH.read(conf)),
            validate_path=_optional_path(VALIDATE_PATH.read(conf)),
            predict_path=_optional_path(PREDICT_PATH.read(conf)),
            parquet_label_col=str(PARQUET_LABEL_COL.read(conf)),
            parquet_ids_col=str(PARQUET_IDS_COL.read(conf)),
            parquet_values_col=str(PARQUET_VALUES_COL.read(conf)),
            chunk_rows=int(CHUNK_ROWS.read(conf)),
        )

    @property
    def holds_out_validation(self) -> bool:
        """Whether validation rows come out of the training input (no validation path, ratio > 0)."""
        return not self.validate_path and self.validate_ratio > 0


def split_period(opts: DataOptions) -> int:
    """``P = ceil(1 / ml.data.validate.ratio)``, the block length of worker parts; 1 when the ratio is 0."""
    ratio = opts.validate_ratio
    # The epsilon keeps 1/0.05 = 20.000000000000004 from becoming 21.
    return max(1, math.ceil(1.0 / ratio - 1e-9)) if ratio > 0 else 1
