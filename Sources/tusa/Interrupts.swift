import Call
import Dispatch
import Foundation
import Synchronization

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

/// Ctrl-C for a call: the agent hangs up once there is one; a Ctrl-C that comes
/// before (while the rendezvous is reached) is kept for it.
final class HangUpSwitch: Sendable {
    private let state = Mutex<(agent: CallAgent?, pressed: Bool)>((nil, false))

    func press() {
        let agent = state.withLock { s -> CallAgent? in
            s.pressed = true
            return s.agent
        }
        agent?.hangUp()
    }

    func attach(_ agent: CallAgent) {
        let pressed = state.withLock { s -> Bool in
            s.agent = agent
            return s.pressed
        }
        if pressed { agent.hangUp() }
    }
}
