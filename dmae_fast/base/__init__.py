"""What every layer uses and nothing of the package's above it: errors and how they are said
(:mod:`.errors`, :mod:`.messages`), a user's files (:mod:`.files`, :mod:`.locking`, :mod:`.integrity`),
the host allocator (:mod:`.memory`), lazy package attributes (:mod:`.lazy`) and the commands' parser
and error reporting (:mod:`.command`). Nothing heavy at module level (torch only inside the functions
that take tensors)."""
