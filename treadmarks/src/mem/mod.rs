//! Shared heap mapping, page protection and fault capture (the only unsafe code).
