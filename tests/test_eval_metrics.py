"""Translation metrics on tiny fixed examples with known answers: BLEU, chrF, METEOR (real NLTK with
the WordNet database from Debian's packages), BERTScore (the real all-MiniLM-L6-v2, offline)."""

import os

import pytest
import torch

from trustformer.evaluation import meteor
from trustformer.evaluation.bertscore import (
    BERTScoreUnavailableError,
    corpus_bertscore,
    describe_model,
    resolve_model,
    sentence_bertscores,
)
from trustformer.evaluation.translation import corpus_bleu, corpus_chrf

SENTENCES = ["the cat sat on the mat .", "open the file menu and choose save as"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """BERTScore's model on one torch thread: on a busy 2-core machine two threads wait on each other."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def wordnet(cache):
    return meteor.load_wordnet(cache)


def test_identical_translations_score_the_maximum(wordnet):
    assert corpus_bleu(SENTENCES, SENTENCES) == pytest.approx(100.0)
    assert corpus_chrf(SENTENCES, SENTENCES) == pytest.approx(100.0)
    score = meteor.corpus_meteor(SENTENCES, SENTENCES, wordnet=wordnet)
    assert 0.99 < score <= 1.0  # METEOR's fragmentation penalty keeps it just below 1


def test_meteor_matches_wordnet_synonyms(wordnet):
    # no word in common, stems differ: only WordNet synonymy (car~automobile, quick~fast) aligns them
    synonyms = meteor.sentence_meteor("automobile is fast", "car is quick", wordnet=wordnet)
    unrelated = meteor.sentence_meteor("banana is green", "car is quick", wordnet=wordnet)
    assert synonyms == pytest.approx(0.625, abs=1e-3)
    assert unrelated < 0.2 < synonyms
    assert {"car", "automobile"} <= set(wordnet.synsets("car")[0].lemma_names())


def test_meteor_of_empty_or_unrelated_hypotheses_is_zero(wordnet):
    assert meteor.sentence_meteor("", "the cat", wordnet=wordnet) == 0.0
    assert meteor.corpus_meteor(["xyz qwv"], ["the cat"], wordnet=wordnet) == 0.0
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        meteor.corpus_meteor(["a", "b"], ["a"], wordnet=wordnet)


def test_wordnet_folder_has_the_lexnames_table(cache, wordnet):
    folder = meteor.wordnet_folder(cache)  # built once, then found again
    lines = (folder / "lexnames").read_text().splitlines()
    assert len(lines) == 45
    assert lines[0] == "00\tadj.all\t3" and lines[3] == "03\tnoun.Tops\t1" and lines[44] == "44\tadj.ppl\t3"


def test_missing_wordnet_names_the_debian_packages(monkeypatch, tmp_path):
    monkeypatch.setattr(meteor, "find_wordnet_database", lambda: None)
    with pytest.raises(meteor.WordNetUnavailableError) as err:
        meteor.wordnet_folder(tmp_path)
    assert "wordnet-base" in str(err.value) and "wordnet-sense-index" in str(err.value)
    assert "eval.meteor=false" in str(err.value)


def test_bertscore_with_the_offline_model():
    assert os.path.isdir(resolve_model().model_type)
    scores, label = sentence_bertscores(
        ["the cat sat on the mat", "the automobile is fast", "", "a"],
        ["the cat sat on the mat", "the car is quick", "a reference", ""],
    )
    assert label == describe_model() and "all-MiniLM-L6-v2" in label and "layer 6" in label
    assert scores[0] == pytest.approx(1.0, abs=1e-4)
    assert 0.5 < scores[1] < 0.99  # paraphrase: high but not identical
    assert scores[2] == 0.0 and scores[3] == 0.0  # empty sentences score 0 (bert-score's convention)
    mean, _ = corpus_bertscore(["the cat sat on the mat", ""], ["the cat sat on the mat", "x"])
    assert mean == pytest.approx(0.5, abs=1e-4)


def test_bertscore_model_choice_is_explained():
    assert resolve_model("roberta-large").num_layers == 17  # bert-score's layer for the published numbers
    folder = resolve_model().model_type  # any local model folder: its last layer unless told otherwise
    local = resolve_model(folder)
    assert local.local and local.num_layers == 6 and "(local folder), layer 6" in local.label
    assert resolve_model("some-org/some-model", 4).label == "some-org/some-model, layer 4"
    with pytest.raises(BERTScoreUnavailableError, match="eval.bertscore_layers"):
        resolve_model("some-org/unknown-model")


def test_run_without_wordnet_stops_before_training_naming_the_packages(monkeypatch, tmp_path, capsys):
    from trustformer.cli import main

    monkeypatch.setattr(meteor, "find_wordnet_database", lambda: None)
    assert main(["run", "--preset", "tiny", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "wordnet-base" in err and "wordnet-sense-index" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no round was trained
