/// The voice clock following a sound card's, so that the queues between them
/// (``DeviceFIFO``) need not slip a sample.
///
/// Left alone, the voice clock (the machine's monotonic clock) and the card's crystal
/// drift apart, and each queue keeps its margin by playing a pull a sample shorter or
/// longer now and then: inaudible to a listener, but each slip moves the echo path, the
/// microphone's time against the speaker's, by a sample of the card's (a sixth of one
/// at 8 kHz). An echo canceller's filter is aligned to the sample: one slip on one side
/// costs it its convergence, 42 dB of echo cancelled falling to 7-16 dB through a
/// sound server until it learns the path again. With the voice clock ticking at the
/// card's pace, a microphone and a speaker on the same card (a headset; a sound
/// server's devices) keep their queues level and the echo path still; the drift between
/// the two ends of a call is the jitter buffer's to absorb, as it is between two
/// machines anyway.
///
/// The follower watches one queue's level at each of the voice clock's pulls (the
/// microphone's, or, without one, the speaker's): what it holds, plus what the card has
/// made since its last chunk and not yet delivered (else the level is a saw tooth of a
/// chunk's height whose phase creeps with the drift, and the control chases the phase).
/// It averages that over a second, and steers
/// the voice clock's period so that the average stays at `setpoint`, the middle of the
/// queue's band (a proportional and integral control, at most 2,000 ppm either way).
/// Until a queue is primed it steers nothing, and while the queue is taking back a
/// backlog (a caller's first words kept, a stall) the level is not the clocks' doing:
/// it holds its course (``hold()``). A pure core: no clock, no lock.
public struct DeviceClockFollower: Sendable {
    public enum Queue: Sendable {
        /// A microphone's queue: it grows when the card's clock is the faster.
        case capture
        /// A speaker's queue: it grows when the voice clock is the faster.
        case playback
    }

    public let queue: Queue
    /// The card's samples a second (the queue's unit).
    public let sampleRate: Int
    /// The voice clock's pulls a second (one level seen each).
    public let pullsPerSecond: Int
    /// The voice clock's period against its nominal one: tick every `nominal × scale`.
    public private(set) var scale = 1.0
    /// The level the queue is held at, in samples.
    public let setpoint: Double

    /// How much of a level error (as a share of a second of samples) is corrected a second.
    static let proportional = 1.0 / 16
    /// How much of the accumulated error (in seconds of samples × seconds) is corrected a second.
    static let integral = 1.0 / 300
    /// The most the voice clock is sped up or slowed down: far beyond any crystal's drift.
    static let limit = 2e-3

    private var sum = 0.0
    private var seen = 0
    private var accumulated = 0.0

    public init(queue: Queue, sampleRate: Int, pullsPerSecond: Int, setpoint: Double) {
        self.queue = queue
        self.setpoint = setpoint
        self.sampleRate = max(1, sampleRate)
        self.pullsPerSecond = max(1, pullsPerSecond)
    }

    /// The queue's level at a pull, in samples (nil: not primed, or run dry: the control
    /// starts again from that queue's next level).
    public mutating func observe(level: Double?) {
        guard let level else {
            sum = 0
            seen = 0
            accumulated = 0
            scale = 1
            return
        }
        sum += level
        seen += 1
        guard seen >= pullsPerSecond else { return }
        let average = sum / Double(seen)
        sum = 0
        seen = 0
        // In seconds of the card's samples: positive when the queue is above its place.
        let error = (average - setpoint) / Double(sampleRate)
        accumulated += error
        // A microphone's queue above its place: the card is the faster, the voice clock
        // must tick sooner (a smaller period); a speaker's: the voice clock is, later.
        let speedUp = Self.proportional * error + Self.integral * accumulated
        let signed = queue == .capture ? speedUp : -speedUp
        scale = 1 - min(max(signed, -Self.limit), Self.limit)
        // The integral is not wound up past what the limit allows.
        if abs(signed) > Self.limit { accumulated -= error }
    }

    /// A pull whose level says nothing of the clocks (the queue is taking back a
    /// backlog): the period stays as it is, and the second's average starts again.
    public mutating func hold() {
        sum = 0
        seen = 0
    }
}
