module github.com/inferroute/inferroute/examples

go 1.26.0

replace github.com/inferroute/inferroute => ../
