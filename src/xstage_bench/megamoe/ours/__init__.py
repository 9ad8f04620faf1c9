"""Our kernel's arms: the interleaved lead ('auto' from the fitted model), the check and its
verdict, paired timing, and the traces' waits and spans."""
