#if canImport(Glibc)
    import Glibc
#endif

/// Asks the kernel to run the calling thread ahead of ordinary work, as sound servers
/// and audio applications do for their audio threads (nice -11, PulseAudio's own
/// default): a thread that wakes every few milliseconds to move audio must not wait
/// behind a compiler or a browser for its turn, or the call hears a gap, or a backlog
/// of delay. Allowed to root and to users whose RLIMIT_NICE permits it (Debian's
/// `audio` group, for one); elsewhere the thread keeps the priority it has, and
/// nothing else changes. Returns whether it was raised.
@discardableResult
public func raiseAudioThreadPriority() -> Bool {
    #if canImport(Glibc)
        // (On Linux a nice value belongs to a thread, and 0 names the calling one.)
        return setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, -11) == 0
    #else
        return false
    #endif
}
