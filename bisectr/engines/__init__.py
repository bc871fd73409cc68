"""Every way of running a side's ops again: one module per kind of re-run, each holding the recorded-call
interpreter and its model-code twin side by side."""
