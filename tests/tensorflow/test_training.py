"""A LeNet-style Keras model trains on TFRecords read through monarch://, and
Monarch's stats show where the bytes came from."""

from conftest import run_child, write_config

EPOCHS = 3
FILES = 8


def train(mnist_dataset, tmp_path, capacity):
    root, total = mnist_dataset
    config = write_config(tmp_path / "monarch.yaml", root, [("ram", capacity, None)])
    result, _ = run_child("train", {"root": root, "epochs": EPOCHS},
                          env={"MONARCH_CONFIG": config})
    loss = result["loss"]
    assert len(loss) == EPOCHS and loss[-1] < loss[0], loss
    return result["stats"], total


def source_bytes_per_epoch(snapshots):
    read = [s["tiers"][-1]["bytes_read"] for s in snapshots]
    return [read[0]] + [b - a for a, b in zip(read, read[1:])]


def test_training_reads_each_file_from_source_once(mnist_dataset, tmp_path):
    snapshots, total = train(mnist_dataset, tmp_path, capacity=4 * mnist_dataset[1])
    last = snapshots[-1]
    # Every file was copied up once and the source served exactly the
    # dataset's bytes over all three epochs: each file was read from it once.
    assert last["promotions_completed"] == FILES
    assert last["tiers"][0]["files"] == FILES
    assert source_bytes_per_epoch(snapshots) == [total, 0, 0]
    assert last["tiers"][-1]["bytes_read"] == total


def test_training_with_half_capacity_keeps_reading_the_rest(mnist_dataset, tmp_path):
    total = mnist_dataset[1]
    snapshots, _ = train(mnist_dataset, tmp_path, capacity=total // 2)
    last = snapshots[-1]
    # First fit without eviction: half the (equal-size) files fit in the tier.
    assert last["tiers"][0]["files"] == FILES // 2
    assert last["tiers"][0]["bytes_used"] <= total // 2
    assert last["promotions_skipped"] > 0
    # The source keeps serving the half that did not fit, every epoch.
    per_epoch = source_bytes_per_epoch(snapshots)
    assert per_epoch[0] >= total
    for later in per_epoch[1:]:
        assert 0.4 * total <= later <= 0.6 * total, per_epoch
