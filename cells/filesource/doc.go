// Package filesource is the state machine that every input source of a
// table shares: the ip-masq-agent file, the CiliumNode file and the
// PolicyEndpoint directory (and, through Update and Fail, their API server
// counterparts). Each of them reads its input, diffs the result into a
// statedb table, initializes the table once, logs each distinct error and
// set of warnings once, reports health and metrics, and keeps the last good
// state in force when the input goes bad. Written once here, the sources
// differ only in what they are: how the input is read and parsed, which
// rows it gives, and what they say when it is missing or invalid.
//
// It is infrastructure: it imports no feature package.
package filesource
