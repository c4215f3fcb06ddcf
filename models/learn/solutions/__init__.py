"""The reference solutions, one file per exercise in the workspace's names and signatures:
`python -m models.learn solution N` prints one (after a pass or the last hint), beside glassgrad's
own code; the proof tests copy them into a workspace and check that every one passes."""
