"""What every layer uses and nothing of the package's above it: errors, messages, a user's files, locks, hashes, the
host allocator, lazy attributes and the commands' error reporting. No torch at module level."""
