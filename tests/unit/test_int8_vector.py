"""The ``int8`` vector encoder's conversion (issue 19): :func:`scopekb.fields.int8_vector` scales each vector by
127 / its largest absolute value, so nothing is clipped and the cosine barely moves."""

from __future__ import annotations

import numpy as np

from scopekb import fields as F


def test_largest_value_becomes_127_and_cosine_is_kept() -> None:
    rng = np.random.default_rng(8)
    for _ in range(50):
        v = rng.normal(size=384)
        v /= np.linalg.norm(v)
        q = F.int8_vector(v)
        assert len(q) == 384 and all(isinstance(x, int) and -127 <= x <= 127 for x in q)
        assert max(abs(x) for x in q) == 127
        qa = np.asarray(q, dtype=float)
        assert float(qa @ v / np.linalg.norm(qa)) > 0.999  # the same direction


def test_scale_free_and_edge_cases() -> None:
    assert F.int8_vector([0.5, -0.25, 0.0]) == F.int8_vector([2.0, -1.0, 0.0]) == [127, -64, 0]
    assert F.int8_vector([0.0, 0.0]) == [0, 0]
    assert F.stored_vector([0.5, -1], "int8") == [64, -127]
    assert F.stored_vector([1, 2], "none") == [1.0, 2.0] and F.stored_vector([1, 2], "sq") == [1.0, 2.0]


def test_mapping_and_settings_of_the_int8_encoder() -> None:
    prop = F.chunk_mapping(384, "m", "int8")["properties"][F.EMBEDDING]
    assert prop["data_type"] == "byte" and prop["doc_values"] is False
    assert "data_type" not in F.chunk_mapping(384, "m")["properties"][F.EMBEDDING]
    # derived source cannot read byte vectors (k-NN 2.19.1): int8 keeps them in _source
    assert F.chunk_index_settings(1, 0, knn=True, encoder="int8")["index"]["knn.derived_source.enabled"] is False
    assert F.chunk_index_settings(1, 0, knn=True)["index"]["knn.derived_source.enabled"] is True
    assert F.chunk_index_settings(1, 0, knn=False)["index"]["codec"] == "best_compression"
    names = {F.index_version_name("a", 384, "m", e) for e in ("none", "sq", "int8")}
    assert len(names) == 3
