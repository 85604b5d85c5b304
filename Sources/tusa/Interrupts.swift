import Dispatch
import Foundation

/// Ctrl-C and SIGTERM while a call or a party runs: the first runs `action` (hang
/// up or leave, then report); a second, should that take too long, exits at once
/// with 130, as the shell's Ctrl-C would have. Cancel the returned sources when done.
func onInterrupt(_ action: @escaping @Sendable () -> Void) -> [any DispatchSourceSignal] {
    let seen = NSLock()
    nonisolated(unsafe) var count = 0
    return [SIGINT, SIGTERM].map { number in
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler {
            let first = seen.withLock {
                count += 1
                return count == 1
            }
            if first { action() } else { exit(130) }
        }
        source.resume()
        return source
    }
}
