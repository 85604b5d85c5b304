import TusaBase

/// Which members' voice the relay forwards: at most `maxSpeakers` at once, the
/// loudest, with hysteresis so that a speaker is not cut mid-word, and silence
/// dropped after a few frames (the receivers conceal the rest).
///
/// A member's loudness is an exponential average of its voiced frames' levels
/// (RFC 6464: 0 loudest, 127 silence). A member who is not a speaker takes the
/// place of the quietest speaker only when it is louder by `margin` dB and that
/// speaker has held its place for `minimumHold`; a speaker who stays silent for
/// `release` gives its place up.
public struct SpeakerSelector: Sendable {
    public struct Configuration: Sendable, Hashable {
        public var maxSpeakers = 3
        /// Silent frames still forwarded after a voiced one (the tail of a word).
        public var silentFramesForwarded = 3
        /// How long a speaker may be silent before its place is free.
        public var release: Duration = .milliseconds(1000)
        /// How long a speaker keeps its place against a louder newcomer.
        public var minimumHold: Duration = .milliseconds(500)
        /// How much louder (dB) a newcomer must be to displace a speaker.
        public var margin: Double = 6
        public init() {}
    }

    struct Speaker {
        var since: Timestamp
        var lastVoiced: Timestamp
        var silentRun: Int
    }

    public let configuration: Configuration
    /// Average loudness in dB above −127 dBov (higher is louder), per member.
    private var loudness: [MemberID: Double] = [:]
    private var speakers: [MemberID: Speaker] = [:]

    public init(configuration: Configuration = .init()) {
        self.configuration = configuration
    }

    /// The members whose voice is forwarded now.
    public var current: Set<MemberID> { Set(speakers.keys) }

    /// Whether to forward this frame of `member`'s.
    public mutating func admit(_ member: MemberID, level: AudioLevel, now: Timestamp) -> Bool {
        if level.voiced {
            let l = 127 - Double(level.level)
            loudness[member] = loudness[member].map { $0 * 0.8 + l * 0.2 } ?? l
        }
        expire(now: now)
        if var s = speakers[member] {
            if level.voiced {
                s.lastVoiced = now
                s.silentRun = 0
            } else {
                s.silentRun += 1
            }
            speakers[member] = s
            return level.voiced || s.silentRun <= configuration.silentFramesForwarded
        }
        guard level.voiced else { return false }
        if speakers.count < configuration.maxSpeakers {
            speakers[member] = Speaker(since: now, lastVoiced: now, silentRun: 0)
            return true
        }
        // Full: displace the quietest speaker that has held long enough, if this one is clearly louder.
        let mine = loudness[member] ?? 0
        let candidates = speakers.filter { now - $0.value.since >= configuration.minimumHold }
        guard let quietest = candidates.min(by: { (loudness[$0.key] ?? 0) < (loudness[$1.key] ?? 0) }),
            mine >= (loudness[quietest.key] ?? 0) + configuration.margin
        else { return false }
        speakers[quietest.key] = nil
        speakers[member] = Speaker(since: now, lastVoiced: now, silentRun: 0)
        return true
    }

    /// Forgets a member that left.
    public mutating func remove(_ member: MemberID) {
        speakers[member] = nil
        loudness[member] = nil
    }

    private mutating func expire(now: Timestamp) {
        for (m, s) in speakers where now - s.lastVoiced >= configuration.release {
            speakers[m] = nil
        }
    }
}
