/// The 64-bit packet index of RTP media: rollover counter (ROC) << 16 | SEQ.
public struct ExtendedSequence: Sendable {
    /// RFC 3711 Appendix A: the index `seq` most likely stands for, given the
    /// highest index accepted so far (`nil` before the first packet: ROC 0).
    /// A sequence number that looks like the previous roll while ROC is 0
    /// is taken as ROC 0 (there is no earlier roll).
    public static func estimate(_ seq: UInt16, highest: UInt64?) -> UInt64 {
        guard let highest else { return UInt64(seq) }
        let sL = UInt16(truncatingIfNeeded: highest)
        let roc = highest >> 16
        let v: UInt64
        if sL < 0x8000 {
            // seq − s_l > 2^15: seq belongs to the previous roll.
            v = (seq > sL && seq - sL > 0x8000 && roc > 0) ? roc - 1 : roc
        } else {
            // s_l − 2^15 > seq: seq belongs to the next roll.
            v = (sL - 0x8000 > seq && roc < (UInt64(1) << 48) - 1) ? roc + 1 : roc
        }
        return v << 16 | UInt64(seq)
    }
}
