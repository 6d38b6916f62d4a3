module github.com/inferroute/inferroute

go 1.24
