"""BM25 product search over the documents upstream indexes.

Upstream searches a pyserini/Lucene index (Java) of one document per product:
``title + description + first bullet point + "name: v1, v2, and name: ..."``
(lower-cased), with Lucene's English analyzer (stop words, Porter stemming),
BM25, top 50. This module builds the same documents and ranks them with
``bm25s`` (pure Python/numpy) with English stop words and the Snowball English
stemmer (``PyStemmer``). Products that share no term with the query are not
returned, as with Lucene.
"""

from __future__ import annotations

import bm25s
import numpy as np

try:
    import Stemmer
except ImportError as err:  # pragma: no cover - depends on the install
    raise ImportError("milegpo's WebShop search needs PyStemmer: pip install 'milegpo[webshop]'") from err

#: Upstream's number of search results (SEARCH_RETURN_N).
SEARCH_RETURN_N = 50


class ProductSearch:
    """A BM25 index over product documents, queried with free text.

    :param ids: the product ids (asins), one per document.
    :param documents: the document texts.
    """

    def __init__(self, ids: list[str], documents: list[str]):
        if len(ids) != len(documents) or not ids:
            raise ValueError("ProductSearch needs one id per document and at least one document")
        self.ids = list(ids)
        self._stemmer = Stemmer.Stemmer("english")
        tokens = bm25s.tokenize(documents, stopwords="en", stemmer=self._stemmer, show_progress=False)
        self._retriever = bm25s.BM25()
        self._retriever.index(tokens, show_progress=False)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """The ids of the (at most ``k``) best-matching documents, best first."""
        terms = bm25s.tokenize([query.lower()], stopwords="en", stemmer=self._stemmer,
                               show_progress=False, return_ids=False)
        if not terms[0]:
            return []
        k = min(k, len(self.ids))
        docs, scores = self._retriever.retrieve(terms, k=k, show_progress=False, n_threads=1)
        return [self.ids[int(d)] for d, s in zip(docs[0], scores[0]) if s > 0 and np.isfinite(s)]
