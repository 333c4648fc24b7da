"""What a run leaves, and the one reader of its checkpoints: the logged metrics' names
(:mod:`~capsexp.records.metric_names`), the machine and the code's revision it ran on
(:mod:`~capsexp.records.machine`, :mod:`~capsexp.records.revision`), its event files read back
(:mod:`~capsexp.records.events`), the record every checkpoint carries
(:mod:`~capsexp.records.run_record`), its model card (:mod:`~capsexp.records.model_card`), and the
checkpoint reader that builds the model of a run (:mod:`~capsexp.records.checkpoints`). Training, a
trained model's use and the results pages stand on it."""
