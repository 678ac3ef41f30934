// Package prose holds no code: its test keeps what espd says to an
// administrator short. Every flag's help fits in 120 characters and every
// log message in 160 (a log record's attributes carry the details).
package prose
