"""trainreport.citations: a figure quoted in prose must be in the table its claim cites."""

from trainreport import citations, docs
from trainreport.docs import Table


def tables(text):
    return {"speed": Table("README.md", "x", "runs/x", lambda root: text)}


def write(tmp_path, prose):
    (tmp_path / "README.md").write_text(prose)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("No claims. 3.5 ms.\n")


def test_a_figure_its_table_holds_passes_and_one_it_does_not_fails(tmp_path):
    write(tmp_path, "Intro 9.9 ms. SparDL is 1.73-1.84x ahead (rows:\n`speed`). Then 7.7 s.\n")
    found, checked = citations.problems(str(tmp_path), tables("| a | 1.73 / 1.84 |"))
    assert (found, checked) == ([], 2)  # 9.9 and 7.7 belong to no claim
    found, _ = citations.problems(str(tmp_path), tables("| a | 1.73 / 1.85 |"))
    assert len(found) == 1 and "1.84 is not in table speed" in found[0]


def test_an_unknown_table_is_named(tmp_path):
    write(tmp_path, "Fast (rows: `nope`).\n")
    found, _ = citations.problems(str(tmp_path), tables(""))
    assert found == ["README.md:1: cites an unknown table 'nope'"]


def test_the_published_claims_match_their_tables():
    root = docs.__file__.rsplit("/trainreport/", 1)[0]
    found, checked = citations.problems(root, docs.TABLES)
    assert not found and checked > 0, found
