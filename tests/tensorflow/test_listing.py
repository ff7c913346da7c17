"""tf.io.gfile and Keras see the same tree through monarch:// as on the plain
path; errors map to the right TensorFlow exceptions; a bad config fails
clearly at first access; the interpreter exits cleanly while readers run."""

import os

import pytest

from conftest import run_child, write_config


def test_listing_matches_plain_filesystem(tree_dataset, tmp_path):
    root, _ = tree_dataset
    # The embedded default config over MONARCH_DATASET, given through a
    # symlink while the queries use the real path.
    link = tmp_path / "link"
    link.symlink_to(root)
    result, _ = run_child("listing", {"root": root, "link": str(link)},
                          env={"MONARCH_DATASET": str(link)})
    plain, monarch = result["plain"], result["monarch"]
    assert plain.keys() == monarch.keys()
    for key in plain:
        assert monarch[key] == plain[key], key
    # Sanity: the comparison covered what it should.
    assert plain["glob with space/*spaces*"] == ["/with space/file with spaces.txt"]
    assert plain["exists a/b/c/deep file.txt"] and not plain["exists missing"]
    assert len(plain["keras images"]) == 6
    assert result["errors"] == {
        "missing": "NotFoundError", "outside": "NotFoundError",
        "directory": "FailedPreconditionError", "tfrecord": "NotFoundError",
        "outside exists": False, "via symlink": True}
    assert result["stats"]["tiers"][-1]["kind"] == "source"


@pytest.mark.parametrize("case", ["bad_value", "missing_file", "unset"])
def test_bad_config_fails_clearly_at_first_access(tree_dataset, tmp_path, case):
    root, _ = tree_dataset
    if case == "bad_value":
        config = write_config(tmp_path / "bad.yaml", root, [("ram", "12 parsecs", None)])
        env, expected, words = {"MONARCH_CONFIG": config}, "InvalidArgumentError", "capacity"
    elif case == "missing_file":
        config = str(tmp_path / "nope.yaml")
        env, expected, words = {"MONARCH_CONFIG": config}, "FailedPreconditionError", "nope.yaml"
    else:
        env, expected, words = {}, "FailedPreconditionError", "MONARCH_CONFIG"
    result, stderr = run_child("bad_config", {"root": root}, env=env)
    attempts = result["attempts"]
    assert [kind for kind, _ in attempts] == [expected] * len(attempts), attempts
    for _, message in attempts:
        assert words in message, message
    # Opened once, reported once: no retry (and no log line) per access.
    assert stderr.count("monarch_tf:") == 1, stderr


def test_interpreter_exits_cleanly_while_readers_run(records_dataset, tmp_path):
    root, total = records_dataset
    config = write_config(tmp_path / "monarch.yaml", root, [("ram", 2 * total, None)],
                          threads=2)
    _, stderr = run_child("exit_while_reading", {"root": root}, timeout=120,
                          env={"MONARCH_CONFIG": config})
    for bad in ("terminate called", "Segmentation", "Aborted", "pure virtual"):
        assert bad not in stderr
