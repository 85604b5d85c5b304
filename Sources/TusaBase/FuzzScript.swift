/// A fuzz input read as a script (the fuzz checks that drive a core step by
/// step): an operation byte per step, then what the operation takes, byte by
/// byte or as a run. Reading past the end gives nil or what is left: a script
/// ends where its input does.
public struct FuzzScript {
    private let bytes: [UInt8]
    private var position = 0
    private var steps = 0
    /// Steps at most (each ``nextStep()``): a long input does not run for long.
    public let maximumSteps: Int

    public init(_ bytes: [UInt8], maximumSteps: Int = 128) {
        self.bytes = bytes
        self.maximumSteps = maximumSteps
    }

    /// The next step's operation byte; nil at the input's end or past ``maximumSteps``.
    public mutating func nextStep() -> UInt8? {
        guard steps < maximumSteps else { return nil }
        steps += 1
        return next()
    }

    /// The next byte (an operation's argument); nil at the input's end.
    public mutating func next() -> UInt8? {
        guard position < bytes.count else { return nil }
        defer { position += 1 }
        return bytes[position]
    }

    /// The next `count` bytes, or as many as are left.
    public mutating func take(_ count: Int) -> [UInt8] {
        let end = min(bytes.count, position + max(0, count))
        defer { position = end }
        return Array(bytes[position..<end])
    }
}
