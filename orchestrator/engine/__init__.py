"""Running a job: placement, the host session and pipeline, recovery, teardown."""
