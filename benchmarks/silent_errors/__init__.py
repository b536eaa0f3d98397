"""Real-world silent training errors: CPU ports of the TrainCheck reproductions
(OrderLab/TrainCheck-Evaluation-Workloads, ``silent-issue-detection/bug-reprod-scripts``), each with a
buggy and a fixed variant recorded by ``NeuralDbg`` at its defaults and scored by ``python -m
benchmarks.silent_errors`` (``docs/diagnosis.md``, "Real-world silent errors")."""
