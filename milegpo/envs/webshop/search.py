"""BM25 product search over the documents upstream indexes.

Upstream searches a pyserini/Lucene index (Java) of one document per product:
``title + description + first bullet point + "name: v1, v2, and name: ..."``
(lower-cased), analysed by Lucene's English analyzer and ranked by Anserini's
BM25 (k1 = 0.9, b = 0.4), top 50. This module builds the same documents and
ranks them with ``bm25s`` (pure Python/numpy) set up like Anserini:

* BM25 with Lucene's idf, k1 = 0.9, b = 0.4 (Anserini's defaults, not bm25s' 1.5 / 0.75);
* tokens are runs of word characters *including single characters* (sizes "8",
  the "t" of "t-shirt"; bm25s' default pattern drops them), lower-cased;
* Lucene's 33 English stop words (``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET``), not a longer list;
* the Porter stemmer (PyStemmer's ``porter``), Lucene's ``PorterStemFilter``.

Still different from Lucene: its StandardTokenizer follows Unicode word-break
rules (e.g. it keeps "3.5" and "e.g" whole, where this splits them at the dot),
and its possessive filter turns "men's" into "men" where this yields "men" and
"s". Products that share no term with the query are not returned, as with Lucene.
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
#: Anserini's BM25 defaults (what pyserini's LuceneSearcher uses unless told otherwise).
BM25_K1, BM25_B = 0.9, 0.4
#: Lucene's English stop words (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET).
LUCENE_STOP_WORDS = (
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with"
).split()
#: every run of word characters, single characters included (Lucene keeps "8" and the "t" of "t-shirt")
TOKEN_PATTERN = r"(?u)\b\w+\b"


class ProductSearch:
    """A BM25 index over product documents, queried with free text.

    :param ids: the product ids (asins), one per document.
    :param documents: the document texts.
    """

    def __init__(self, ids: list[str], documents: list[str]):
        if len(ids) != len(documents) or not ids:
            raise ValueError("ProductSearch needs one id per document and at least one document")
        self.ids = list(ids)
        self._stemmer = Stemmer.Stemmer("porter")
        tokens = bm25s.tokenize(documents, token_pattern=TOKEN_PATTERN, stopwords=LUCENE_STOP_WORDS,
                                stemmer=self._stemmer, show_progress=False)
        self._retriever = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="lucene")
        self._retriever.index(tokens, show_progress=False)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """The ids of the (at most ``k``) best-matching documents, best first."""
        terms = bm25s.tokenize([query.lower()], token_pattern=TOKEN_PATTERN, stopwords=LUCENE_STOP_WORDS,
                               stemmer=self._stemmer, show_progress=False, return_ids=False)
        if not terms[0]:
            return []
        k = min(k, len(self.ids))
        # n_threads=0: bm25s runs a single query inline (any other value starts a thread pool per call)
        docs, scores = self._retriever.retrieve(terms, k=k, show_progress=False, n_threads=0)
        return [self.ids[int(d)] for d, s in zip(docs[0], scores[0]) if s > 0 and np.isfinite(s)]
