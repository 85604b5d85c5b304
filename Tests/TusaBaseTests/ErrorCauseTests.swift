import Testing
import TusaBase

private struct DiskFull: Error, CustomStringConvertible {
    var description: String { "no space left on device" }
}

private struct OtherDiskFull: Error, CustomStringConvertible {
    var description: String { "no space left on device" }
}

@Suite("ErrorCause: a lower layer's error kept inside a higher one's")
struct ErrorCauseTests {
    @Test func theErrorIsKeptAsThrown() {
        let cause = ErrorCause(DiskFull())
        #expect(cause.error is DiskFull)
        #expect(cause.description == "no space left on device")
    }

    @Test func aCauseOfACauseIsTheErrorItself() {
        let cause = ErrorCause(ErrorCause(DiskFull()))
        #expect(cause.error is DiskFull)
        #expect(cause == ErrorCause(DiskFull()))
    }

    @Test func equalOnlyWhenTypeAndTextAgree() {
        #expect(ErrorCause(DiskFull()) == ErrorCause(DiskFull()))
        #expect(ErrorCause(DiskFull()) != ErrorCause(OtherDiskFull()))
        let set: Set = [ErrorCause(DiskFull()), ErrorCause(DiskFull()), ErrorCause(OtherDiskFull())]
        #expect(set.count == 2)
    }
}
