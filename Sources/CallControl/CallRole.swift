/// Which side of a call we are: the caller sent the offer and is ICE's
/// controlling agent; the callee answered it and is the controlled one.
public enum CallRole: String, Sendable, Hashable {
    case caller
    case callee
}
