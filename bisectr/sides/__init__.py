"""Where a side's model runs, answering the requests of the search: in this process (`runner.LocalSide`, each
request answered by its engine), in a worker process (`isolate`) or on the ranks torchrun starts (`ranks`)."""
